"""``Person``, the type every service and access rule takes for a person, is the user
model Django is configured with, so the type checker's view of people cannot drift from
the rows the foreign keys to ``settings.AUTH_USER_MODEL`` hold."""

from django.contrib.auth import get_user_model

from approvals.people import Person


def test_the_person_type_is_the_configured_user_model():
    assert get_user_model() is Person
