"""Words: the vocabulary, the interface with the implementations, the errors. Standard library only."""
