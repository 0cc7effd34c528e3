"""The exact-term recall set: ids, codes, names and rare words.

A platform engineer's work log and life admin: ticket numbers, error codes,
hosts, invoices, booking references, product codes, people. Nearly every
answer has a near miss beside it — ``OPS-2291`` and ``OPS-2219``, two hotels
with transposed booking references, two Priyas — and the rest of the set is
about the same topics, so what decides the right memory is the exact term.
Questions are asked the way people ask them: a bare id pasted in, or a
sentence around it.
"""

from __future__ import annotations

#: key -> (category, content, importance)
MEMORIES: dict[str, tuple[str, str, int]] = {
    # -- tickets ----------------------------------------------------------------
    "t01": (
        "work",
        "OPS-2291: the nightly invoice export times out against the read replica; raised "
        "statement_timeout to 120s as a stopgap.",
        6,
    ),
    "t02": (
        "work",
        "OPS-2219: flaky readiness probe on the search pods; closed as a duplicate of the "
        "probe misconfiguration.",
        4,
    ),
    "t03": (
        "work",
        "OPS-2290: rotate the TLS certificate for api.internal before 30 June.",
        7,
    ),
    "t04": (
        "work",
        "OPS-1922: the export job for the finance team was moved from cron to Airflow.",
        4,
    ),
    "t05": (
        "work",
        "SEC-118: the contractor accounts were not removed from the VPN group; cleaned up "
        "and added an offboarding check.",
        7,
    ),
    "t06": (
        "work",
        "SEC-181: a public S3 bucket with marketing PDFs; made it private and moved the "
        "files to the CDN.",
        5,
    ),
    "t07": (
        "work",
        "INC-4410: checkout returned 502s for 14 minutes after a bad Envoy config push.",
        8,
    ),
    "t08": (
        "work",
        "INC-4401: login emails were delayed by two hours because the SES quota ran out.",
        6,
    ),
    # -- error codes and failures -----------------------------------------------
    "e01": (
        "work",
        "ERR-5013 from the payment gateway means the merchant signature was rejected; "
        "regenerate the HMAC key in the portal.",
        7,
    ),
    "e02": (
        "work",
        "ERR-5031 from the payment gateway is their rate limit; back off and retry after "
        "the Retry-After header.",
        6,
    ),
    "e03": (
        "work",
        "Postgres 40P01 (deadlock detected) in the refunds worker when two refunds touch "
        "the same order row.",
        6,
    ),
    "e04": (
        "work",
        "Postgres 40001 (serialization failure) in the ledger job; it retries up to three "
        "times, which is usually enough.",
        5,
    ),
    "e05": (
        "work",
        "The partner API answers 429 once we pass 600 requests a minute; batch the catalogue sync.",
        5,
    ),
    "e06": (
        "work",
        "The partner API answers 409 when an idempotency key is reused with a different body.",
        5,
    ),
    "e07": (
        "work",
        "ECONNRESET from the Redis client under load was the server's maxclients limit; "
        "raised it to 20000.",
        6,
    ),
    "e08": (
        "work",
        "ETIMEDOUT from the Redis client during the failover drill; the client timeout "
        "was shorter than the failover.",
        5,
    ),
    "e09": (
        "work",
        "The thumbnailer pods exit with code 137 (OOMKilled) on huge TIFF uploads; limit "
        "raised to 2 GiB.",
        6,
    ),
    "e10": (
        "work",
        "Exit code 143 during deploys is just SIGTERM from the rollout; not an error.",
        3,
    ),
    "e11": (
        "work",
        "CVE-2023-44487 (HTTP/2 rapid reset): patched the edge proxies and capped streams "
        "per connection.",
        8,
    ),
    "e12": (
        "work",
        "CVE-2023-4863 (libwebp heap overflow): rebuilt the image service on the patched "
        "base image.",
        8,
    ),
    "e13": (
        "work",
        "The regression in the search ranking was introduced in commit a41f9c2 and "
        "reverted in 9c2a41f.",
        5,
    ),
    "e14": (
        "work",
        "Disk on db-prod-07 reports SMART errors; the storage team is swapping it on Thursday.",
        7,
    ),
    "e15": (
        "work",
        "db-prod-01 is the primary; db-prod-02 and db-prod-03 are the replicas.",
        6,
    ),
    "e16": (
        "work",
        "The invoices_v2 table is the source of truth; invoices_v2_archive holds rows "
        "older than two years.",
        5,
    ),
    "e17": (
        "work",
        "Kafka topic payments.settled.v3 replaced payments.settled.v2 in March; the v2 "
        "consumers are gone.",
        5,
    ),
    "e18": (
        "work",
        "The nightly backup of the analytics cluster failed with 'ENOSPC: no space left on "
        "device'.",
        6,
    ),
    # -- projects and code names -----------------------------------------------
    "c01": (
        "project",
        "MARLIN is the code name for the data lake migration; the first tables move in Q3.",
        6,
    ),
    "c02": (
        "project",
        "MARLOWE is the marketing site rebuild on Astro; launch is planned for September.",
        5,
    ),
    "c03": (
        "project",
        "Feature flag wombat_pricing switches on the new pricing page for 5% of visitors.",
        5,
    ),
    "c04": (
        "project",
        "Feature flag wombat_checkout was removed after the checkout experiment ended.",
        3,
    ),
    "c05": (
        "project",
        "The data lake migration needs sign-off from the finance team before any table moves.",
        5,
    ),
    # -- people -----------------------------------------------------------------
    "p01": (
        "people",
        "Priya Raman is the staff engineer on payments and reviews every schema change.",
        6,
    ),
    "p02": (
        "people",
        "Priya Ramesh is the recruiter at Northwind who reached out about a principal role.",
        4,
    ),
    "p03": (
        "people",
        "Raman Gill runs facilities; ask him for desk moves and building passes.",
        3,
    ),
    "p04": (
        "people",
        "Jon Eriksen from legal reviews every new vendor contract.",
        5,
    ),
    "p05": (
        "people",
        "Dr. John Erickson is the family dentist; the practice is on Bridge Street.",
        5,
    ),
    "p06": (
        "people",
        "Ngozi Adeyemi is the new product manager for search; weekly sync on Mondays.",
        5,
    ),
    "p07": (
        "people",
        "Ngozi Okafor is the school nurse at Hillside; call her about Leo's inhaler.",
        6,
    ),
    "p08": (
        "people",
        "Siobhan from the data team owns the dbt models for revenue reporting.",
        4,
    ),
    "p09": (
        "people",
        "Sébastien Marchetti is the on-call lead for the infrastructure team this quarter.",
        4,
    ),
    "p10": (
        "people",
        "The new product manager for payments has not been hired yet; the interview loop "
        "starts next week.",
        3,
    ),
    # -- travel -----------------------------------------------------------------
    "r01": (
        "travel",
        "Hotel Arcadia in Lisbon, booking reference KX4TQ9, check-in 12 May, two nights.",
        6,
    ),
    "r02": (
        "travel",
        "Hotel Arcadia in Porto, booking reference KX4QT9, check-in 14 May, one night.",
        6,
    ),
    "r03": (
        "travel",
        "Flight LH1172 Frankfurt to Lisbon on 11 May departs at 08:05 from gate Z25.",
        6,
    ),
    "r04": (
        "travel",
        "Flight LH1127 Lisbon to Frankfurt on 15 May departs at 19:40.",
        6,
    ),
    "r05": (
        "travel",
        "Train Porto to Lisbon on 15 May: Alfa Pendular 133, coach 4, seat 62.",
        5,
    ),
    "r06": (
        "travel",
        "Car hire in Porto with Sixt, confirmation 9912-3381, pick-up at the airport.",
        4,
    ),
    "r07": (
        "travel",
        "Conference badge for Lisbon is in the email from the organisers; the registration "
        "code is on it.",
        3,
    ),
    "r08": (
        "travel",
        "Global Entry renewal approved; the known traveler number is unchanged.",
        4,
    ),
    # -- home, money, admin -----------------------------------------------------
    "h01": (
        "home",
        "Ordered the replacement filter HX-400B for the bedroom air purifier.",
        3,
    ),
    "h02": (
        "home",
        "The HX-400 filter (without the B) only fits the older living-room purifier.",
        3,
    ),
    "h03": (
        "home",
        "Dishwasher is a Bosch SMV46KX01E; the warranty runs until March 2026.",
        4,
    ),
    "h04": (
        "home",
        "Washing machine is a Bosch WGG14400; its door seal was replaced under warranty.",
        4,
    ),
    "h05": (
        "home",
        "Car registration KL-482-ZT; the MOT is due in November.",
        5,
    ),
    "h06": (
        "home",
        "The old car, KL-428-ZT, was sold in 2022; the paperwork is in the blue folder.",
        2,
    ),
    "h07": (
        "finance",
        "Invoice INV-20931 from Brightwire for 1,240 euros was paid on 3 March.",
        4,
    ),
    "h08": (
        "finance",
        "Invoice INV-20913 from Brightwire is disputed: they billed two site visits, there "
        "was one.",
        6,
    ),
    "h09": (
        "finance",
        "Electricity account 30017745 with Greenpower; the meter is read every quarter.",
        4,
    ),
    "h10": (
        "finance",
        "Gas account 30017754 with Greenpower; switch to the fixed tariff in October.",
        5,
    ),
    "h11": (
        "finance",
        "Home insurance policy HP-77120-A renews on 1 October; the excess is 250 euros.",
        6,
    ),
    "h12": (
        "finance",
        "Travel insurance policy TP-71120 covers the whole family for winter sports.",
        5,
    ),
    "h13": (
        "home",
        "The sourdough starter is called Clint Yeastwood; feed him every Sunday.",
        2,
    ),
    "h14": (
        "home",
        "Parcel 1Z999AA10123456784 from UPS is the new monitor; it needs a signature.",
        3,
    ),
    "h15": (
        "home",
        "Work laptop: ThinkPad X1 Carbon Gen 11, serial PF3K2Z9, asset tag NW-0448.",
        4,
    ),
    "h16": (
        "home",
        "Old laptop: ThinkPad X1 Carbon Gen 9, serial PF2K3Z9, to be returned to IT.",
        3,
    ),
    "h17": (
        "preferences",
        "Loved the 2019 Quinta do Crasto Reserva at Clara's; buy a case for the anniversary.",
        3,
    ),
    "h18": (
        "preferences",
        "The 2019 Quinta do Vallado was too tannic for my taste.",
        2,
    ),
    "h19": (
        "health",
        "Repeat prescription RX-58812 for levothyroxine 50 mcg, collected monthly at Boots.",
        7,
    ),
    "h20": (
        "health",
        "Prescription RX-58821 for the eczema cream was a one-off; no repeat needed.",
        3,
    ),
    "h21": (
        "home",
        "The router is a FritzBox 7590; the admin page is at 192.168.178.1.",
        3,
    ),
    "h22": (
        "home",
        "Locker 117 at the climbing gym is mine until December.",
        2,
    ),
    # -- topic neighbours without the term ---------------------------------------
    "n01": ("work", "The on-call rotation changes on Mondays at 10:00.", 4),
    "n02": ("work", "Wrote the postmortem for the checkout outage; action items are in Jira.", 6),
    "n03": ("work", "The payment gateway's sandbox resets every night at midnight UTC.", 3),
    "n04": ("work", "Most Postgres errors in the workers come from long transactions.", 4),
    "n05": ("work", "Redis memory is at 70%; plan a bigger instance before the sale.", 5),
    "n06": ("work", "The search pods were moved to the new node pool on Tuesday.", 3),
    "n07": ("work", "Certificates for the internal services are issued by Vault.", 5),
    "n08": ("work", "The image service resizes uploads to four sizes on write.", 3),
    "n09": ("work", "Deploys are frozen from 20 December to 3 January.", 6),
    "n10": ("work", "The partner API's documentation is out of date for the webhooks.", 3),
    "n11": ("work", "Invoice exports for finance now run at 02:00 instead of midnight.", 4),
    "n12": ("work", "Security review of the new vendor is scheduled with legal.", 5),
    "n13": ("work", "Kafka retention on the payments topics is seven days.", 4),
    "n14": ("work", "The analytics cluster was resized to six nodes.", 3),
    "n15": ("work", "Database failover drill passed; the replicas caught up in 40 seconds.", 5),
    "n16": ("work", "Schema changes need a migration plan in the pull request.", 4),
    "n17": (
        "work",
        "Reverted a commit that broke the nightly build; blamed a missing lockfile.",
        3,
    ),
    "n18": ("work", "A recruiter from a fintech startup emailed about a staff role.", 2),
    "n19": ("travel", "Lisbon trip: the conference is at the FIL centre, 12 to 14 May.", 6),
    "n20": ("travel", "Porto: want to visit the Livraria Lello and eat a francesinha.", 3),
    "n21": ("travel", "Frankfurt airport lounge access comes with the Gold card.", 2),
    "n22": ("travel", "Booking references for the summer holiday are in the shared note.", 3),
    "n23": ("home", "The air purifier in the bedroom is louder than it used to be.", 2),
    "n24": ("home", "Bosch customer service needs the model number for any repair.", 3),
    "n25": ("finance", "Brightwire is the electrician firm that rewired the kitchen.", 4),
    "n26": ("finance", "Greenpower's customer line is open weekdays 8 to 6.", 2),
    "n27": (
        "finance",
        "Insurance renewals all land in the autumn; compare prices in September.",
        5,
    ),
    "n28": ("health", "The pharmacy at Boots texts when a prescription is ready.", 3),
    "n29": ("people", "The facilities desk is on the ground floor next to reception.", 2),
    "n30": ("people", "The legal team wants contracts at least two weeks before signing.", 4),
    "n31": ("people", "Leo's school is Hillside Primary; the office opens at 8:15.", 4),
    "n32": ("home", "The monitor on the home desk flickers; a new one is on order.", 2),
    "n33": ("preferences", "Prefers Portuguese reds; Douro wines in particular.", 3),
    "n34": ("home", "Car service is at the Skoda dealer; they do the MOT too.", 3),
    "n35": ("work", "The marketing site is on WordPress until the rebuild ships.", 3),
    "n36": ("work", "Feature flags are cleaned up at the end of each quarter.", 3),
    "n37": ("work", "Exit interviews for contractors are handled by HR.", 2),
    "n38": ("home", "The climbing gym is open until 23:00 on weekdays.", 2),
    "n39": ("work", "HTTP/2 is enabled on the edge proxies since last year.", 3),
    "n40": ("work", "Data team standup is at 9:45; Siobhan runs it.", 2),
}

#: (question, keys of the memories that answer it)
QUERIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("OPS-2291", ("t01",)),
    ("what happened with OPS-2219?", ("t02",)),
    ("OPS-2290 deadline", ("t03",)),
    ("OPS-1922", ("t04",)),
    ("SEC-118", ("t05",)),
    ("what did we do about SEC-181", ("t06",)),
    ("INC-4410", ("t07",)),
    ("INC-4401 root cause", ("t08",)),
    ("ERR-5013", ("e01",)),
    ("how to handle ERR-5031", ("e02",)),
    ("40P01", ("e03",)),
    ("Postgres 40001", ("e04",)),
    ("why does the partner API return 409?", ("e06",)),
    ("partner API 429", ("e05",)),
    ("ECONNRESET", ("e07",)),
    ("ETIMEDOUT redis", ("e08",)),
    ("exit code 137", ("e09",)),
    ("CVE-2023-44487", ("e11",)),
    ("CVE-2023-4863", ("e12",)),
    ("a41f9c2", ("e13",)),
    ("db-prod-07", ("e14",)),
    ("which host is db-prod-01", ("e15",)),
    ("invoices_v2_archive", ("e16",)),
    ("payments.settled.v3", ("e17",)),
    ("ENOSPC", ("e18",)),
    ("MARLIN", ("c01",)),
    ("what is MARLOWE", ("c02",)),
    ("wombat_pricing", ("c03",)),
    ("Priya Ramesh", ("p02",)),
    ("what does Raman Gill do", ("p03",)),
    ("John Erickson", ("p05",)),
    ("Jon Eriksen", ("p04",)),
    ("who is Ngozi Adeyemi", ("p06",)),
    ("Ngozi Okafor phone", ("p07",)),
    ("Sébastien Marchetti", ("p09",)),
    ("KX4TQ9", ("r01",)),
    ("which hotel is booking KX4QT9", ("r02",)),
    ("LH1127 departure time", ("r04",)),
    ("LH1172", ("r03",)),
    ("Alfa Pendular 133 seat", ("r05",)),
    ("HX-400B", ("h01",)),
    ("SMV46KX01E warranty", ("h03",)),
    ("KL-482-ZT", ("h05",)),
    ("INV-20913", ("h08",)),
    ("was INV-20931 paid?", ("h07",)),
    ("account 30017754", ("h10",)),
    ("HP-77120-A", ("h11",)),
    ("Clint Yeastwood", ("h13",)),
    ("PF3K2Z9", ("h15",)),
    ("Quinta do Crasto", ("h17",)),
    ("RX-58812", ("h19",)),
    ("FritzBox 7590 admin page", ("h21",)),
)
