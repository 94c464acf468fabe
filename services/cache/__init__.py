"""microco.services.cache"""
