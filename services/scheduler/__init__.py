"""microco.services.scheduler"""
