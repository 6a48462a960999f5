"""Command implementations behind the `fab` tasks: parse, run, print, return an exit code."""
