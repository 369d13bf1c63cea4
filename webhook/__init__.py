"""The admission webhooks: /mutate serves the translator, /validate enforces policy."""
