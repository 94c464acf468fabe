"""microco.services.common"""
