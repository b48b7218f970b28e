"""Reference receivers the service is compared with, served like `webhook-inbox serve` is."""
