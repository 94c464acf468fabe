"""microco.services"""
