"""The kvroute command line."""
