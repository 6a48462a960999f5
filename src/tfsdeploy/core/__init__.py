"""The pure core: inventory, catalog, rendering, validation, GPU plans, the host layout, the
canary, guard and comparison policies, diagnosis. Typed, frozen data and functions over it;
nothing here reaches a host (no SSH, Docker or HTTP library is imported)."""
