"""HTTP blueprints: thin views that validate, make one storage call and serialize."""
