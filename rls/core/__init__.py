"""The core of rls, below config, stores and engine: the limits model (`limits`), checks and
verdicts (`model`), the admission rule (`admission`), the algorithm registry with the memory
implementations (`algorithms`), counter keys (`keys`) and usage statistics (`usage`).

Imports nothing from rls outside this package.
"""
