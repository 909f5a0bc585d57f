import factory
from django.contrib.auth import get_user_model

from ledger import services as ledger
from ledger.models import Account


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")


class AccountFactory(factory.django.DjangoModelFactory):
    """An account, funded through a real deposit entry when ``funded`` > 0."""

    class Meta:
        model = Account
        skip_postgeneration_save = True

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"account {n}")

    @factory.post_generation
    def funded(obj, create, extracted, **kwargs):
        if create and extracted:
            ledger.deposit(account_id=obj.pk, amount=extracted)
            obj.refresh_from_db()
