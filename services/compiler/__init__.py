"""microco.services.compiler"""
