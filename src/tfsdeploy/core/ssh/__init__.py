"""Whether a host's SSH key is trusted, decided as OpenSSH's client decides it: known_hosts, host
certificates, the policy (pure)."""
