"""The machine a run happens on: device and versions, git, whether it is busy, child processes, files."""
