"""What a runbook hangs around a run on the deploy machine: its hook executables and the
event notifications posted to its receivers."""
