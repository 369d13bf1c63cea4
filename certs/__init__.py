"""Certificates: a CA and serving certificates, rotation, caBundle injection."""
