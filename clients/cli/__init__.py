"""microco.clients.cli"""
