"""marshmallow schemas, one module per API."""
