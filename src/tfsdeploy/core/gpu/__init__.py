"""GPU memory as a real card reports it (pure): nvidia-smi's figures parsed, each process's
holding mapped to its container, the memory planned for a process judged against what it
holds, and the host-wide reservations that keep two windows from overcommitting one GPU."""
