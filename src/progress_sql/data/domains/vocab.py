"""Word lists the domain generators draw realistic values from (names, places, title words)."""

from __future__ import annotations

FIRST_NAMES = (
    "James", "Mary", "John", "Patricia", "Robert", "Jennifer", "Michael", "Linda", "William",
    "Elizabeth", "David", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah",
    "Charles", "Karen", "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark",
    "Sandra", "Paul", "Ashley", "Steven", "Emily", "Andrew", "Donna", "Joshua", "Michelle",
    "Kevin", "Carol", "Brian", "Amanda", "George", "Melissa", "Edward", "Deborah", "Ronald",
    "Laura", "Timothy", "Rebecca", "Jason", "Sharon", "Ahmed", "Fatima", "Wei", "Mei", "Hiroshi",
    "Yuki", "Carlos", "Sofia", "Luca", "Giulia", "Pierre", "Camille", "Hans", "Greta", "Olga",
    "Ivan", "Priya", "Arjun", "Kwame", "Amara", "Lars", "Ingrid", "Mateo", "Lucia", "Omar",
    "Leila", "Noah", "Chloe", "Ethan", "Zoe",
)

LAST_NAMES = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez",
    "Martinez", "Hernandez", "Lopez", "Gonzalez", "Wilson", "Anderson", "Thomas", "Taylor",
    "Moore", "Jackson", "Martin", "Lee", "Perez", "Thompson", "White", "Harris", "Sanchez",
    "Clark", "Ramirez", "Lewis", "Robinson", "Walker", "Young", "Allen", "King", "Wright",
    "Scott", "Torres", "Nguyen", "Hill", "Flores", "Green", "Adams", "Nelson", "Baker", "Hall",
    "Rivera", "Campbell", "Mitchell", "Carter", "Roberts", "Kim", "Chen", "Wang", "Tanaka",
    "Sato", "Rossi", "Bianchi", "Dubois", "Moreau", "Schmidt", "Fischer", "Ivanov", "Petrov",
    "Patel", "Singh", "Mensah", "Okafor", "Larsen", "Berg", "Silva", "Santos", "Haddad", "Novak",
)

CITIES = (
    "London", "Paris", "Berlin", "Madrid", "Rome", "Amsterdam", "Vienna", "Prague", "Lisbon",
    "Dublin", "Stockholm", "Oslo", "Copenhagen", "Warsaw", "Athens", "New York", "Chicago",
    "Boston", "Seattle", "Austin", "Denver", "Toronto", "Vancouver", "Montreal", "Mexico City",
    "Sao Paulo", "Buenos Aires", "Tokyo", "Osaka", "Seoul", "Beijing", "Shanghai", "Singapore",
    "Mumbai", "Delhi", "Sydney", "Melbourne", "Cairo", "Nairobi", "Cape Town",
)

COUNTRIES = (
    "United States", "United Kingdom", "France", "Germany", "Spain", "Italy", "Netherlands",
    "Sweden", "Norway", "Denmark", "Poland", "Portugal", "Ireland", "Canada", "Mexico", "Brazil",
    "Argentina", "Japan", "South Korea", "China", "India", "Australia", "Egypt", "Kenya",
    "South Africa", "Nigeria",
)

ADJECTIVES = (
    "Silent", "Golden", "Broken", "Hidden", "Crimson", "Endless", "Frozen", "Wild", "Lonely",
    "Burning", "Electric", "Secret", "Distant", "Bright", "Dark", "Hollow", "Sweet", "Last",
    "Restless", "Velvet", "Lost", "Quiet", "Savage", "Little", "Midnight", "Northern", "Iron",
)

NOUNS = (
    "River", "Garden", "Shadow", "Dream", "Ocean", "Storm", "Heart", "City", "Road", "Mountain",
    "Fire", "Star", "Window", "Winter", "Summer", "Kingdom", "Mirror", "Voice", "Island",
    "Forest", "Horizon", "Train", "Letter", "Empire", "Harbor", "Bridge", "Moon", "Thunder",
)

# The first word of a place or business name ("Riverside Vet Clinic", "Oakwood Fitness").
PLACE_WORDS = (
    "Riverside", "Hillcrest", "Oakwood", "Maple", "Cedar", "Lakeside", "Northgate", "Southbank", "Westfield",
    "Eastwood", "Greenway", "Harbour", "Kingsley", "Sunnyvale", "Brookside", "Ashford", "Fairview", "Highland",
    "Meadowbrook", "Stonebridge", "Elmhurst", "Bayview", "Silverdale", "Redwood", "Foxhill",
)

# Fresh identifiers for renamed copies of training domains (``domains.renaming``): common nouns
# with regular plurals, no SQL keywords. A build drops any that a held-out domain uses.
RENAME_WORDS = (
    "acorn", "anchor", "anvil", "apricot", "arch", "arrow", "atlas", "badge", "bagel", "balcony",
    "bamboo", "banner", "barrel", "basket", "beacon", "beetle", "bell", "berry", "blanket",
    "blossom", "boulder", "bracket", "breeze", "brick", "bucket", "bundle", "button", "cabin",
    "cactus", "candle", "canyon", "carpet", "castle", "cedar", "chalk", "channel", "chapel",
    "cherry", "chimney", "cider", "cliff", "clover", "cobble", "comet", "compass", "copper",
    "coral", "cotton", "crane", "crater", "crayon", "creek", "crystal", "cushion", "dagger",
    "daisy", "delta", "desert", "diamond", "dolphin", "dragon", "drum", "dune", "eagle", "ember",
    "emerald", "engine", "falcon", "feather", "fern", "ferry", "fiddle", "flame", "flint",
    "fountain", "fossil", "galaxy", "garnet", "geyser", "ginger", "glacier", "goblet", "granite",
    "gravel", "grove", "hammer", "harp", "hazel", "helmet", "hermit", "hinge", "hollow", "honey",
    "igloo", "ink", "ivory", "jacket", "jasmine", "jewel", "jigsaw", "kettle", "kite", "ladder",
    "lagoon", "lantern", "lava", "lemon", "lever", "lily", "lizard", "locket", "lotus", "magnet",
    "mango", "maple", "marble", "meadow", "meteor", "mint", "mitten", "mosaic", "moss", "nectar",
    "needle", "nest", "nickel", "nugget", "oak", "oasis", "olive", "onion", "orbit", "orchid",
    "otter", "paddle", "pebble", "pepper", "petal", "pigeon", "pillar", "pine", "planet", "plum",
    "pocket", "pollen", "pond", "poppy", "prism", "puddle", "pulley", "pumpkin", "quartz", "quill",
    "radish", "raft", "raven", "reed", "ribbon", "ridge", "rocket", "saddle", "saffron", "sail",
    "sapphire", "scarf", "shell", "shovel", "signal", "silk", "sparrow", "spindle", "spruce",
    "squirrel", "summit", "sundial", "swan", "tablet", "tambourine", "teapot", "thimble",
    "thistle", "thorn", "tiger", "timber", "tulip", "tunnel", "turnip", "tusk", "umbrella",
    "valley", "vessel", "violet", "walnut", "wagon", "whistle", "willow", "wizard", "yarn",
    "zephyr", "zigzag",
)
