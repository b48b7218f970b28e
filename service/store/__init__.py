"""The store: the only code that knows the inbox's SQL."""
