"""The paraphrase recall set: questions in other words than their answers.

One user's household, family, health and habits, as a personal assistant
would have noted them. Every question is phrased the way a person asks it,
and shares (almost) no content word with the memory that answers it —
``tests/test_recall_quality.py`` checks that mechanically. Most of the other
memories are distractors: they share the question's topic or, more often, its
everyday words (``doctor``, ``car``, ``teacher``, ``birthday``) without
answering it, which is what a real journal is full of.
"""

from __future__ import annotations

#: key -> (category, content, importance)
MEMORIES: dict[str, tuple[str, str, int]] = {
    # -- memories that answer a question ---------------------------------------
    "a01": (
        "health",
        "Reacted badly to amoxicillin in 2018 (an itchy rash all over); tell any GP before "
        "they prescribe.",
        9,
    ),
    "a02": (
        "home",
        "Hannah at number 12 feeds and walks Pepper, our dog, whenever we are out of town; "
        "she has a spare lead.",
        6,
    ),
    "a03": ("family", "Jonas drinks Earl Grey with a splash of milk and one sugar.", 3),
    "a04": (
        "health",
        "Runs along the canal three mornings a week (Mon, Wed, Fri) before breakfast.",
        5,
    ),
    "a05": (
        "family",
        "Ms. Okonkwo is in charge of Leo's year-three class at Hillside Primary.",
        6,
    ),
    "a06": (
        "travel",
        "Always books a window place near the front of the cabin; gets claustrophobic "
        "squeezed into the middle of a row.",
        4,
    ),
    "a07": (
        "finance",
        "The garage replaced the brake pads and discs on the car; the bill came to 430 euros.",
        4,
    ),
    "a08": (
        "health",
        "Lactose intolerant: dairy gives stomach cramps. Oat or soy alternatives are fine.",
        8,
    ),
    "a09": ("family", "Mother was born on 17 June 1958; she loves orchids.", 7),
    "a10": (
        "work",
        "Saturday and Sunday access to the office: badge plus PIN at the side entrance on "
        "Clement Lane.",
        4,
    ),
    "a11": (
        "family",
        "At Mum and Dad's the network is called Willow-5G; the key is on a note stuck to "
        "the fridge.",
        3,
    ),
    "a12": ("health", "GP is Dr. Farah Siddiqui at the Elm Street practice.", 7),
    "a13": (
        "finance",
        "Subscriptions: Netflix and the Spotify family plan, both charged to the joint "
        "credit card.",
        4,
    ),
    "a14": (
        "family",
        "Jonas and I spent two weeks in Sicily right after the wedding in 2016.",
        5,
    ),
    "a15": ("preferences", "Feet are EU 39, sometimes 40 in trainers.", 3),
    "a16": (
        "health",
        "Home monitor has read around 128 over 82 for the last month; the nurse said that is fine.",
        6,
    ),
    "a17": (
        "work",
        "Takes the 7:40 train into town; door to desk is about 35 minutes.",
        4,
    ),
    "a18": (
        "home",
        "Handyman Piotr does small repairs (shelves, taps, door hinges); he answers calls "
        "on Thursdays.",
        4,
    ),
    "a19": (
        "health",
        "Twenty minutes of evening yoga and a chamomile brew help her relax when things "
        "get hectic.",
        5,
    ),
    "a20": (
        "home",
        "Bins go out on Sunday night: the council collects general waste on Monday and "
        "recycling every other Monday.",
        4,
    ),
    "a21": (
        "family",
        "Leo is frightened of thunderstorms and wants the hall light left on.",
        5,
    ),
    "a22": (
        "learning",
        "Practising Italian on Duolingo every evening, 15 minutes; the app keeps a streak.",
        4,
    ),
    "a23": ("finance", "Salary after the April raise: 58,000 a year gross.", 6),
    "a24": (
        "home",
        "If the boiler breaks down, ring Kowalski Gas Services; the 24-hour line is on the "
        "sticker next to the meter.",
        6,
    ),
    "a25": (
        "family",
        "Last December I bought Jonas a turntable as his holiday gift; he plays it every weekend.",
        4,
    ),
    "a26": (
        "work",
        "Annual leave balance: nine out of twenty-five remain after the Easter break.",
        5,
    ),
    "a27": (
        "health",
        "Gym membership at FitHub on Carver Road, renewed by direct debit.",
        3,
    ),
    "a28": (
        "family",
        "Leo has football on Tuesdays and Nora has ballet on Thursdays, both straight after class.",
        6,
    ),
    "a29": ("preferences", "Orders beef medium-rare, never well done.", 3),
    "a30": (
        "finance",
        "Taxes are handled by Ruth Abernathy at Abernathy & Co; her fee is 350 a year.",
        5,
    ),
    "a31": (
        "family",
        "Booked a table at Osteria Lucca for 14 September to celebrate ten years married.",
        7,
    ),
    "a32": (
        "travel",
        "Passport valid until February 2027; the ID card renewal is due next spring.",
        7,
    ),
    "a33": (
        "home",
        "A duplicate set of keys hangs in the lockbox behind the shed; its code is 4471.",
        6,
    ),
    "a34": (
        "preferences",
        "Could watch Spirited Away a hundred times; Miyazaki is the greatest director.",
        2,
    ),
    "a35": ("family", "Our son measured 131 cm at his check-up in January.", 3),
    "a36": (
        "family",
        "Clara asked me to make a tiramisu for her dinner on Saturday.",
        5,
    ),
    "a37": ("people", "Closest mate since school is Aisha; we phone each other every Sunday.", 6),
    "a38": (
        "home",
        "The garage warned that the rear tyres are nearly bald; replace them before winter.",
        6,
    ),
    "a39": (
        "health",
        "Gets queasy on boats and winding roads; ginger tablets and sitting up front help.",
        4,
    ),
    "a40": (
        "family",
        "Oma was raised on a farm near Groningen before moving to Rotterdam.",
        3,
    ),
    "a41": (
        "finance",
        "Gives 20 euros to the Westside food bank by standing order each payday.",
        4,
    ),
    "a42": (
        "learning",
        "Started pottery classes at the community studio in February; made two bowls so far.",
        3,
    ),
    "a43": (
        "family",
        "Nora settles at bedtime only with the whale lullaby and her stuffed rabbit.",
        6,
    ),
    "a44": (
        "finance",
        "The other driver rear-ended our car at the roundabout; his insurer accepted liability.",
        6,
    ),
    "a45": (
        "health",
        "Lipid panel in March: LDL slightly high at 3.6; advised less red meat and a recheck "
        "in six months.",
        7,
    ),
    "a46": (
        "people",
        "Jonas's cousin Mateo is a vet in Utrecht; happy to answer questions about Pepper.",
        4,
    ),
    # -- distractors: same topic or same everyday words, no answer -------------
    "d01": (
        "health",
        "Takes ibuprofen for the occasional migraine; the medicine cabinet is in the upstairs "
        "bathroom.",
        4,
    ),
    "d02": (
        "home",
        "Pepper the dog needs her booster jab in May at the Greenfield animal clinic.",
        5,
    ),
    "d03": ("travel", "We go away to the coast every August; the cottage is booked.", 5),
    "d04": ("home", "Bought a new tea kettle; the old one had limescale in the spout.", 2),
    "d05": (
        "health",
        "Signed up for the city half marathon in October; the long run is on Sundays.",
        5,
    ),
    "d06": (
        "family",
        "Parent-teacher evening was moved to 12 March; the sign-up sheet is online.",
        5,
    ),
    "d07": (
        "travel",
        "Flight to Berlin on 3 May; the plane leaves at 07:15 from terminal 2.",
        5,
    ),
    "d08": ("finance", "Car insurance renews in January with Allianz.", 5),
    "d09": ("finance", "We spend about 200 a month on fuel for the car.", 3),
    "d10": (
        "work",
        "Avoid scheduling anything on Friday afternoons.",
        4,
    ),
    "d11": (
        "finance",
        "Eating out budget is 150 a month; we usually go over it in December.",
        3,
    ),
    "d12": (
        "family",
        "Jonas's birthday party is at the bowling alley; my mum will bring the cake.",
        6,
    ),
    "d13": (
        "work",
        "Work laptop is a ThinkPad; IT will reimage it over the weekend.",
        3,
    ),
    "d14": ("family", "Mum and Dad's house needs a new roof; quotes are around 9,000 euros.", 2),
    "d15": (
        "health",
        "Doctor appointment for the annual check-up is on 9 April at 8:30.",
        6,
    ),
    "d16": ("finance", "We pay the gas bill quarterly, about 310 euros each time.", 4),
    "d17": ("family", "Our wedding album is finally back from the printer.", 2),
    "d18": ("health", "Needs new running shoes before the half marathon.", 4),
    "d19": ("health", "Donated blood in March; the next slot opens in July.", 3),
    "d20": ("travel", "Long weekend in Ghent planned for July; the train is booked.", 4),
    "d21": ("home", "The house insurance covers accidental damage but not the garden shed.", 4),
    "d22": (
        "work",
        "A stressful day on Tuesday because the launch slipped; wrote it up for the retro.",
        3,
    ),
    "d23": ("finance", "Child benefit arrives on the 28th of each month.", 3),
    "d24": ("learning", "Learning to bake sourdough; the starter lives in the fridge.", 3),
    "d25": ("home", "The heating bill went up 30% this winter.", 5),
    "d26": ("family", "Christmas is at my sister's this year; Jonas is doing the dessert.", 5),
    "d27": ("work", "Holiday request for the first week of August was approved.", 4),
    "d28": ("health", "Left the gym bag at the office again.", 1),
    "d29": ("family", "Nora wants a pet rabbit for her birthday; we said maybe.", 3),
    "d30": ("finance", "Need to find an accountant for Dad's estate paperwork.", 5),
    "d31": ("home", "Plan for the garden: raised beds for tomatoes in spring.", 3),
    "d32": ("travel", "Lost my car keys at the cinema; found at the lost property desk.", 2),
    "d33": ("preferences", "Film night with friends every other Friday; it is my turn to host.", 3),
    "d34": ("family", "My son wants to be an astronaut this week.", 2),
    "d35": ("family", "Dinner party at the Nguyens' was lovely; bring them wine next time.", 3),
    "d36": ("people", "Best man at our wedding was Jonas's brother Felix.", 3),
    "d37": ("travel", "The ferry to Texel takes twenty minutes; we went by car.", 2),
    "d38": ("family", "Grandmother on Dad's side lived to 96.", 3),
    "d39": ("finance", "Bought two tickets for the hospice charity gala in November.", 2),
    "d40": ("learning", "Recently finished reading a novel about a lighthouse keeper.", 2),
    "d41": ("family", "My daughter fell off her scooter; just a scraped knee.", 4),
    "d42": ("finance", "The dashcam footage from the roundabout is saved in the cloud folder.", 4),
    "d43": ("health", "Cut down on salt after reading about heart health.", 3),
    "d44": ("home", "The car's MOT is due in November.", 2),
    "d45": ("people", "Aunt Marta calls every Sunday after church.", 3),
    "d46": ("work", "My schedule is packed until the product launch in May.", 4),
    "d47": ("home", "Wifi at home drops out in the attic; a mesh extender is on the list.", 3),
    "d48": ("family", "Jonas hates tea bags left in the sink.", 1),
    "d49": ("travel", "Travel adapter and documents live in the blue folder in the hallway.", 3),
    "d50": ("family", "Leo's teacher sent home a note about the school trip to the zoo.", 4),
    "d51": ("health", "Physio said the sore shoulder comes from sleeping on my side.", 4),
    "d52": ("finance", "Paid 90 euros for the parking ticket in Antwerp; lesson learned.", 2),
    "d53": ("home", "Spare room is being turned into an office with a sofa bed.", 3),
    "d54": ("people", "Met Aisha's new boyfriend at the pub quiz; nice guy.", 2),
    "d55": ("family", "Clara's kids stayed over on Friday; pancakes in the morning.", 2),
    "d56": ("preferences", "Can't stand horror films or anything with jump scares.", 3),
    "d57": ("health", "Took the stairs all week instead of the lift.", 1),
    "d58": ("family", "Mum wants to plant a cherry tree in the garden for her seventieth.", 4),
    "d59": ("finance", "Earned a 300 euro bonus for the side project in March.", 3),
    "d60": ("travel", "Seasick on the Dover crossing years ago; never again by sea.", 3),
    "d61": ("home", "The street's recycling bins were knocked over by the storm.", 2),
    "d62": ("family", "Leo's friend Sami is allergic to eggs; check when he visits.", 6),
    "d63": ("preferences", "Favourite restaurant is the Lebanese place on Market Street.", 3),
    "d64": ("finance", "The joint account pays the mortgage on the 1st.", 5),
}

#: (question, keys of the memories that answer it)
QUERIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What medicine makes me break out in hives?", ("a01",)),
    ("Who looks after the dog when we go away?", ("a02",)),
    ("How does my husband take his tea?", ("a03",)),
    ("When do I usually go for a jog?", ("a04",)),
    ("What is the name of my son's teacher?", ("a05",)),
    ("Where do I prefer to sit on a plane?", ("a06",)),
    ("How much did we spend fixing the car?", ("a07",)),
    ("What foods should I avoid eating?", ("a08",)),
    ("When is my mum's birthday?", ("a09",)),
    ("How do I get into the building at work on weekends?", ("a10",)),
    ("How do I get online at my folks' house?", ("a11",)),
    ("Who is my doctor?", ("a12",)),
    ("Which streaming services do we pay for?", ("a13",)),
    ("Where did we go on our honeymoon?", ("a14",)),
    ("What size shoes do I wear?", ("a15",)),
    ("What are my blood pressure numbers like?", ("a16",)),
    ("How long is my commute?", ("a17",)),
    ("Who fixes things around the house?", ("a18",)),
    ("What do I do to unwind after a stressful day?", ("a19",)),
    ("When is the rubbish collected?", ("a20",)),
    ("What is my child scared of?", ("a21",)),
    ("Which language am I learning?", ("a22",)),
    ("How much do I earn?", ("a23",)),
    ("Who do I ring if the heating stops working?", ("a24",)),
    ("What did I give my husband for Christmas?", ("a25",)),
    ("How many vacation days do I have left?", ("a26",)),
    ("Which gym am I a member of?", ("a27",)),
    ("When are the kids' sports activities?", ("a28",)),
    ("How do I like my steak cooked?", ("a29",)),
    ("Who is my accountant?", ("a30",)),
    ("What is the plan for our anniversary?", ("a31",)),
    ("When do my travel documents expire?", ("a32",)),
    ("Where do we keep the spare keys?", ("a33",)),
    ("What is my favourite film?", ("a34",)),
    ("How tall is my son?", ("a35",)),
    ("What should I bring to my sister's dinner party?", ("a36",)),
    ("Who is my best friend?", ("a37",)),
    ("Is anything wrong with the car's wheels?", ("a38",)),
    ("How do I cope with motion sickness?", ("a39",)),
    ("Where did my grandmother grow up?", ("a40",)),
    ("Which charity do I donate to?", ("a41",)),
    ("What hobby did I pick up recently?", ("a42",)),
    ("How do I get my daughter to fall asleep?", ("a43",)),
    ("Who was at fault in the car accident?", ("a44",)),
    ("What is my cholesterol situation?", ("a45",)),
    ("Who can I ask about the dog's health?", ("a46",)),
    ("What do my children do after school?", ("a28",)),
)
