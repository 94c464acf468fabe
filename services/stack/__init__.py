"""microco.services.stack"""
