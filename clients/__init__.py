"""microco.clients"""
