"""The platform's state: the database schema, its migrations and the queries over it."""
