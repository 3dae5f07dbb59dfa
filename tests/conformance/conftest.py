# Register the test-only plugin before the suite is parametrized over the registries.
import tests.conformance.plugin  # noqa: F401
