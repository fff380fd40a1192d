"""crowdtally service and command line."""
