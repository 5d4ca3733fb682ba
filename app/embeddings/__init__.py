"""Embedders: text to vectors, for the semantic half of search. Plain Python, no Flask."""
