"""What an inventory declares (hosts, groups, vars, the model catalog, the gateway, monitoring) and
what its checks derive from it: GPU instances, ports, paths and names on a host (pure)."""
