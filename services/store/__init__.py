"""microco.services.store"""
