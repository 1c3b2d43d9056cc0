"""The type of a person who acts: the user model, named once for both apps.

It lives in ``approvals``, the lowest layer, because both apps and the console take
people and dependencies point one way (console -> operations -> approvals).
"""

from typing import TypeAlias

from django.contrib.auth.models import User

# The model ``settings.AUTH_USER_MODEL`` names, which the project leaves at Django's own.
# The django-stubs plugin reads that setting and types ``get_user_model()`` and every
# foreign key to it as ``User``, so a ``Person`` can be stored in those keys and asked
# for permissions and groups (``has_perm``, ``groups``, ``is_superuser``) without a cast.
# ``AbstractBaseUser`` has none of those (they are ``PermissionsMixin``'s), and
# ``AbstractUser`` is not what the foreign keys hold. A project that swaps the model
# changes this line; tests/approvals/test_people.py fails until it does.
Person: TypeAlias = User
