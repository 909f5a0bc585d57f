"""Times as support staff need them: to the second, with the time zone, sortable.

Django's English default ("Nov. 23, 2026, 9:13 p.m.") drops the seconds and the
zone, so two events a second apart look simultaneous and a reader cannot tell
UTC from local time. Only display formats are set here; input formats and the
API (ISO 8601 from DRF) are unchanged.
"""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
TIME_FORMAT = "H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
