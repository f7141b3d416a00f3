"""API keys and tenants, limits, classifiers over new items only, flag reporting."""
