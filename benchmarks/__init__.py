"""microco.benchmarks"""
