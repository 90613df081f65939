"""Engine discovery: static lists, DNS records, Kubernetes pods as streams of engine-set changes."""
