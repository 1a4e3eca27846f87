"""The SANA-WM model: loading, tiny offline models, recipes, the patched forward and the refiner driver."""
