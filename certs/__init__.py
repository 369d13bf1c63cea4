"""Certificates: a CA and serving certificates, TLS server contexts and live certificate reload.

Injecting the CA into webhook configurations (caBundle) is the webhook's job, through the
cluster port; nothing here talks to the cluster.
"""
