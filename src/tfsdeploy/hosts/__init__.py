"""The hosts: everything that reaches a host of the fleet. SSH, the Docker Engine over it, the
proxy's admin socket, gRPC and HTTP probes of the servers, the facts read of a host, the fleet
lock, and every remote command as an argument list (``commands``); beside them the deploy
machine's own files, written durably (``localfiles``)."""
