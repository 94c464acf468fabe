"""microco.services.console"""
