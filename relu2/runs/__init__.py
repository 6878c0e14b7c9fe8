"""Runs: asv across commits, compare, confirm, bisect, the sweep as a job."""
