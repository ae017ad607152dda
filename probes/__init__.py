"""skewprobe: a caller-side canary and regression probe for service-mesh upgrades."""
