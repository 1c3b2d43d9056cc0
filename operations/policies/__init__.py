"""People's policies in Cedar (docs/policies.md): pure, no Django, no database.

``cedar`` parses and validates a policy against the schema generated from the active
contracts and evaluates the policies in force for one registration or activation;
``files`` splits an operator's Cedar file into policies by their ``@id``.
"""
