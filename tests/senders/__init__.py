"""What each provider sends, built as the provider builds it: shared by a kind's unit tests
(which hand it to the source directly) and its integration tests (which post it over HTTP)."""
