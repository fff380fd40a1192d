"""crowdtally core numerics."""
