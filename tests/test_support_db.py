"""Names of the databases tests make for themselves (tests/support/db.py)."""

from tests.support import db


def test_on_postgresql_a_made_database_is_named_after_the_suites_database_and_worker(
    monkeypatch,
):
    monkeypatch.setattr(db, "ON_POSTGRESQL", True)
    monkeypatch.setattr(db, "CONFIGURED_NAME", "eg_one")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert db.own_database_name("metrics") == "test_eg_one_gw1_metrics"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert db.own_database_name("metrics") == "test_eg_one_gw0_metrics"
    monkeypatch.setattr(db, "CONFIGURED_NAME", "eg_other")
    assert db.own_database_name("metrics") == "test_eg_other_gw0_metrics"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert db.own_database_name("metrics") == "test_eg_other_metrics"
    assert len(db.own_database_name("x" * 100)) == 63  # PostgreSQL's longest name


def test_on_sqlite_a_made_database_is_a_file_of_this_checkout_named_by_its_kind(monkeypatch):
    monkeypatch.setattr(db, "ON_POSTGRESQL", False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert db.own_database_name("metrics") == "effectgate_metrics"
