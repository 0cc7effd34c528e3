"""A fixed retrieval benchmark for :meth:`MemoryStore.recall`.

Seventy memories a personal assistant might hold about one user — work log,
projects with code names and ticket numbers, people, preferences, travel,
health, money, home, family — and thirty-two queries, each with the memories
a person would call relevant. Queries are labelled by what they need:

* ``lexical`` — an exact rare term: a ticket number, error code, code name,
  booking reference or person's name;
* ``semantic`` — a paraphrase sharing no content word with its memories;
* ``mixed`` — some shared words, some paraphrase.

The set was written to look like real use, not to favour a ranking mode.
:func:`evaluate` loads it into a fresh store and reports recall@k for the
``vector``, ``fts`` and ``hybrid`` modes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from coterie.runtime.memory import MemoryStore, Mode

__all__ = ["MEMORIES", "MODES", "PERSONA", "QUERIES", "EvalQuery", "evaluate", "evaluate_by_kind"]

PERSONA = "recall-eval"
MODES: tuple[Mode, ...] = ("vector", "fts", "hybrid")

#: key -> (category, content, importance)
MEMORIES: dict[str, tuple[str, str, int]] = {
    # Work log and projects
    "m01": (
        "work",
        "Deployed release 4.12 of the billing service to production; the rollback plan "
        "was not needed.",
        5,
    ),
    "m02": (
        "project",
        "Project HALCYON is the internal code name for the new search ranking pipeline; "
        "kickoff was on Monday with the data team.",
        7,
    ),
    "m03": (
        "work",
        "Ticket OPS-2291: the nightly ETL job fails with error PG-40001 (serialization "
        "failure) when two loaders overlap. Workaround: stagger the cron by 15 minutes.",
        6,
    ),
    "m04": (
        "work",
        "Investigated a memory leak in the websocket gateway: heap grew 2 GB per day "
        "because subscriptions were never released on disconnect.",
        6,
    ),
    "m05": (
        "work",
        "Code review feedback from Priya: prefer small pull requests, under 400 lines, "
        "with a clear description.",
        5,
    ),
    "m06": (
        "project",
        "Zephyr migration: moving the mobile backend from Heroku to Kubernetes; target "
        "date is the end of Q3.",
        7,
    ),
    "m07": (
        "work",
        "On-call incident INC-7781: checkout latency spiked to 9 seconds after a Redis "
        "failover in eu-west-1.",
        8,
    ),
    "m08": (
        "work",
        "Wrote the postmortem for INC-7781; the main action item is adding client-side "
        "timeouts to the cart service.",
        6,
    ),
    "m09": (
        "work",
        "Sprint planning: committed to 34 story points; the team's velocity has been around 30.",
        3,
    ),
    "m10": (
        "project",
        "Feature flag quokka_checkout gates the one-page checkout experiment; currently "
        "at 10% of traffic.",
        5,
    ),
    "m11": (
        "work",
        "Error E-1138 'tenant quota exceeded' appears when a customer uploads more than "
        "50 GB; support asked for a clearer message.",
        5,
    ),
    "m12": (
        "work",
        "Paired with Tomasz on the gRPC retry policy; we settled on exponential backoff "
        "with jitter, at most 5 attempts.",
        4,
    ),
    "m13": (
        "project",
        "Project BLUEJAY is the codename for the partner analytics dashboard; design "
        "mockups are due next Friday.",
        6,
    ),
    "m14": (
        "work",
        "Submitted the performance review self-assessment; highlighted the billing "
        "migration and mentoring two juniors.",
        5,
    ),
    "m15": (
        "work",
        "Flaky test test_refund_idempotency fails about once in 20 CI runs; suspect clock"
        " skew between containers.",
        4,
    ),
    # People
    "m16": (
        "people",
        "Priya Raman is the staff engineer on the payments team and the user's tech lead.",
        6,
    ),
    "m17": (
        "people",
        "Tomasz Wójcik joined the platform team in January; he is an expert in gRPC and Envoy.",
        5,
    ),
    "m18": (
        "people",
        "The user's manager is Dana Okafor; their weekly 1:1 is on Thursdays at 10:00.",
        7,
    ),
    "m19": (
        "people",
        "Marcus from finance always needs the cloud cost report by the third business day"
        " of the month.",
        6,
    ),
    "m20": ("people", "Sister Elena lives in Porto and has two kids, Rui and Inês.", 6),
    "m21": ("people", "Old university friend Kenji is getting married in Kyoto next April.", 6),
    "m22": ("people", "Neighbour Mrs. Albright waters the plants whenever the user travels.", 3),
    # Preferences
    "m23": ("preferences", "Prefers dark roast coffee, black, no sugar; dislikes oat milk.", 4),
    "m24": (
        "preferences",
        "Wants meeting summaries as bullet points, never longer than half a page.",
        6,
    ),
    "m25": (
        "preferences",
        "Uses Neovim with the Lazy plugin manager; hates VS Code's telemetry.",
        3,
    ),
    "m26": ("preferences", "Vegetarian since 2019, but eats fish occasionally when travelling.", 6),
    "m27": (
        "preferences",
        "Likes to do deep work between 8 and 11 in the morning; no meetings before 11 if possible.",
        7,
    ),
    "m28": ("preferences", "Prefers aisle seats on flights and avoids red-eye connections.", 4),
    "m29": (
        "preferences",
        "Favourite music for focus is ambient electronic, especially Brian Eno.",
        2,
    ),
    # Travel
    "m30": (
        "travel",
        "Booked flights to Lisbon for the conference: TAP TP1351 departing 7 May at 06:40.",
        7,
    ),
    "m31": (
        "travel",
        "The Lisbon hotel is the Memmo Alfama, confirmation number QX7-55812, three nights.",
        6,
    ),
    "m32": ("travel", "Passport expires in November 2026; a renewal takes about six weeks.", 7),
    "m33": (
        "travel",
        "Trip to Kyoto for Kenji's wedding: need to book a ryokan near Gion and a JR Pass.",
        6,
    ),
    "m34": (
        "travel",
        "Lost luggage claim with Lufthansa, reference FRALH48213, still unresolved after "
        "three weeks.",
        5,
    ),
    "m35": (
        "travel",
        "Visited Reykjavik in February; the northern lights tour was cancelled twice "
        "because of clouds.",
        3,
    ),
    # Health
    "m36": (
        "health",
        "Physiotherapy for the left knee every Tuesday at 18:00; exercises are wall "
        "squats and step-ups.",
        6,
    ),
    "m37": ("health", "Allergic to penicillin: had a rash reaction in 2015.", 9),
    "m38": (
        "health",
        "Started taking vitamin D supplements in October after a blood test showed low levels.",
        4,
    ),
    "m39": (
        "health",
        "Dentist appointment on 14 March for a crown replacement with Dr. Haddad.",
        5,
    ),
    "m40": (
        "health",
        "Running goal: a sub-50-minute 10K by September; currently at 54 minutes.",
        5,
    ),
    "m41": (
        "health",
        "Sleeps badly after late-evening screen time; trying to stop using the laptop after 22:00.",
        5,
    ),
    # Money and home
    "m42": (
        "finance",
        "The mortgage's fixed rate ends in August 2025; need to compare offers from two banks.",
        8,
    ),
    "m43": ("finance", "Monthly budget: 400 euros for groceries and 150 for eating out.", 4),
    "m44": (
        "home",
        "The boiler was serviced in September (Vaillant ecoTEC plus); the next service is"
        " due in a year.",
        3,
    ),
    "m45": (
        "home",
        "Broadband provider is Digi; the router password lives in the password manager, not here.",
        2,
    ),
    "m46": (
        "home",
        "Plans to repaint the home office in a light sage green over the Easter weekend.",
        3,
    ),
    "m47": (
        "finance",
        "Pays the car insurance annually in June; the last premium was 612 euros.",
        4,
    ),
    # Learning
    "m48": (
        "learning",
        "Reading 'Designing Data-Intensive Applications'; finished the chapter on replication.",
        3,
    ),
    "m49": ("learning", "Taking an evening Portuguese course, level A2, on Wednesdays online.", 4),
    "m50": (
        "learning",
        "Wants to learn Rust properly this year by building a small CLI tool for log parsing.",
        4,
    ),
    "m51": (
        "learning",
        "Watched Martin Kleppmann's talk on CRDTs; idea: use them for offline notes sync.",
        3,
    ),
    # Family
    "m52": (
        "family",
        "Daughter Maya's school play is on 22 May at 17:30; she plays the narrator.",
        7,
    ),
    "m53": (
        "family",
        "Partner Sam's birthday is 9 October; they like hiking and Japanese whisky.",
        8,
    ),
    "m54": (
        "family",
        "The cat, Biscuit, needs her annual vaccination in June at the Oakwood vet clinic.",
        4,
    ),
    "m55": (
        "family",
        "Parents' 40th wedding anniversary dinner is planned for 3 August in Porto.",
        7,
    ),
    # More work, and everything else
    "m56": (
        "work",
        "Kafka consumer lag on topic orders.v2 exceeded 2 million messages during the "
        "Black Friday load test.",
        5,
    ),
    "m57": (
        "work",
        "The Terraform state lock got stuck after a cancelled apply; fixed it with "
        "terraform force-unlock.",
        4,
    ),
    "m58": (
        "work",
        "The security audit flagged CVE-2024-3094 in the xz package on old build images; "
        "rebuilt all base images.",
        7,
    ),
    "m59": (
        "work",
        "Agreed with the data team that HALCYON will combine BM25 with embeddings using "
        "reciprocal rank fusion.",
        5,
    ),
    "m60": (
        "work",
        "The BLUEJAY demo to the partner success team went well; they asked for CSV export.",
        5,
    ),
    "m61": (
        "work",
        "Interviewed a backend candidate: strong on SQL, weak on system design. "
        "Recommended no hire.",
        3,
    ),
    "m62": (
        "work",
        "Staging database restored from last night's snapshot after a bad migration "
        "dropped the invoices table.",
        6,
    ),
    "m63": ("work", "Dana approved the budget request for two more GPU nodes for the ML team.", 4),
    "m64": ("work", "Hackathon idea: a Slack bot that summarises long incident channels.", 2),
    "m65": ("preferences", "Prefers written async updates over status meetings.", 5),
    "m66": ("health", "Feels stressed before quarterly planning; a walk at lunch helps.", 4),
    "m67": ("travel", "Train to Amsterdam for the team offsite: Eurostar 9114 on 12 June.", 5),
    "m68": (
        "project",
        "Zephyr blocker: the legacy cron worker relies on Heroku Scheduler and needs a "
        "Kubernetes CronJob replacement.",
        6,
    ),
    "m69": ("family", "Maya has a peanut allergy; always check the snacks at birthday parties.", 9),
    "m70": (
        "home",
        "The plumber, Mr. Costa, fixed the water leak under the kitchen sink; invoice 180 euros.",
        3,
    ),
}


@dataclass(frozen=True)
class EvalQuery:
    text: str
    relevant: tuple[str, ...]
    kind: Literal["lexical", "semantic", "mixed"]


QUERIES: tuple[EvalQuery, ...] = (
    EvalQuery("OPS-2291", ("m03",), "lexical"),
    EvalQuery("PG-40001", ("m03",), "lexical"),
    EvalQuery("INC-7781", ("m07", "m08"), "lexical"),
    EvalQuery("E-1138", ("m11",), "lexical"),
    EvalQuery("HALCYON", ("m02", "m59"), "lexical"),
    EvalQuery("quokka_checkout", ("m10",), "lexical"),
    EvalQuery("CVE-2024-3094", ("m58",), "lexical"),
    EvalQuery("QX7-55812", ("m31",), "lexical"),
    EvalQuery("Tomasz", ("m12", "m17"), "lexical"),
    EvalQuery("BLUEJAY", ("m13", "m60"), "lexical"),
    EvalQuery("Envoy expert", ("m17",), "lexical"),
    EvalQuery("Which antibiotics am I unable to take?", ("m37",), "semantic"),
    EvalQuery("How do I like my hot drink?", ("m23",), "semantic"),
    EvalQuery("When is the best time to schedule calls with me?", ("m27",), "semantic"),
    EvalQuery("When is my weekly injury therapy?", ("m36",), "semantic"),
    EvalQuery("Who is my boss?", ("m18",), "semantic"),
    EvalQuery("my kid's food sensitivities", ("m69",), "semantic"),
    EvalQuery("getting the heating system checked", ("m44",), "semantic"),
    EvalQuery("fitness target for the autumn race", ("m40",), "semantic"),
    EvalQuery("foreign language lessons", ("m49",), "semantic"),
    EvalQuery("trouble getting rest at night", ("m41",), "semantic"),
    EvalQuery("pet shots at the animal doctor", ("m54",), "semantic"),
    EvalQuery("choosing a lender to refinance the house loan", ("m42",), "semantic"),
    EvalQuery("Which cloud spending document is due each month?", ("m19",), "mixed"),
    EvalQuery("renewing my passport", ("m32",), "mixed"),
    EvalQuery("moving our mobile servers off Heroku", ("m06", "m68"), "mixed"),
    EvalQuery("why was checkout slow during the cache outage", ("m07", "m08"), "mixed"),
    EvalQuery("birthday present ideas for my partner", ("m53",), "mixed"),
    EvalQuery("where does my sister live", ("m20",), "mixed"),
    EvalQuery("unreliable test in continuous integration", ("m15",), "mixed"),
    EvalQuery("lost suitcase claim reference", ("m34",), "mixed"),
    EvalQuery("what did Priya say about code reviews", ("m05", "m16"), "mixed"),
)


def load(store: MemoryStore) -> dict[str, str]:
    """Write :data:`MEMORIES` under :data:`PERSONA`; returns key -> stored id."""
    from coterie.runtime.memory import MemoryInput

    keys = list(MEMORIES)
    rows = store.write_memories(
        [MemoryInput(PERSONA, cat, text, imp) for cat, text, imp in MEMORIES.values()]
    )
    return {key: row.id for key, row in zip(keys, rows, strict=True)}


def evaluate(store_factory: Callable[[], MemoryStore], k: int = 5) -> dict[str, float]:
    """Mean recall@k over :data:`QUERIES` for each mode of a fresh store."""
    by_kind = evaluate_by_kind(store_factory, k)
    return {mode: by_kind[mode]["all"] for mode in MODES}


def evaluate_by_kind(
    store_factory: Callable[[], MemoryStore], k: int = 5
) -> dict[str, dict[str, float]]:
    """Mean recall@k per mode, overall (``all``) and per query kind."""
    store = store_factory()
    ids = load(store)
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        scores: dict[str, list[float]] = {"all": []}
        for query in QUERIES:
            hits = store.recall(PERSONA, query=query.text, mode=mode, limit=k)
            found = {hit.id for hit in hits}
            relevant = {ids[key] for key in query.relevant}
            score = len(found & relevant) / len(relevant)
            scores["all"].append(score)
            scores.setdefault(query.kind, []).append(score)
        out[mode] = {kind: sum(values) / len(values) for kind, values in scores.items()}
    return out
