"""microco.clients.common"""
