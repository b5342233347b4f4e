"""marshmallow schemas: a load schema per request, a dump schema per response."""
