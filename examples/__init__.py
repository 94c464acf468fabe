"""microco.examples"""
