"""The commands behind the `fab` tasks: options typed, the run or look asked for, the result
printed, every ending mapped to its exit code."""
