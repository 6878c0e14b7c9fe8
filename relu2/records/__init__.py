"""Files on disk: asv's names and results, the tidy rows, the compare folder, the confirm file."""
