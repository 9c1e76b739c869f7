-- Toolsets: named groups of tools with model-facing guidance (the text a
-- model reads before it uses them), enabled or disabled as a whole. The
-- definition (title, guidance, tools, disabled) is json, kept verbatim like a
-- tool's; tools are referred to by name, without a foreign key: a toolset may
-- outlive a tool it names (exports leave such a tool out).
CREATE TABLE toolsets (
    name        text COLLATE "C" PRIMARY KEY,
    version     bigint      NOT NULL CHECK (version > 0),
    source      text        NOT NULL CHECK (source IN ('api', 'file')),
    definition  json        NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
