"""microco.services.agent"""
