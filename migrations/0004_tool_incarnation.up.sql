-- A tool's incarnation: a random id given when the tool is created, kept
-- across updates. Deregistering a tool and registering the name again makes
-- a new incarnation (its version restarts at 1), so approvals and previews
-- record the incarnation they were given for, not only the version: an
-- approval of the old tool never lets the new one run.
ALTER TABLE tools ADD COLUMN incarnation text;
UPDATE tools SET incarnation = gen_random_uuid()::text;
ALTER TABLE tools ALTER COLUMN incarnation SET NOT NULL;
ALTER TABLE tools ADD CONSTRAINT tools_incarnation_check CHECK (incarnation <> '');

-- '' is "no incarnation known", which matches no tool: such an approval or
-- preview is invalidated when its call comes back.
ALTER TABLE approvals ADD COLUMN tool_incarnation text NOT NULL DEFAULT '';
ALTER TABLE previews ADD COLUMN tool_incarnation text NOT NULL DEFAULT '';

-- Existing approvals and previews belong to the current incarnation of their
-- tool if they were made after it was created; older ones were made for a
-- tool of the same name that has since been deregistered, and keep ''.
UPDATE approvals a SET tool_incarnation = t.incarnation
    FROM tools t WHERE a.tool = t.name AND a.created_at >= t.created_at;
UPDATE previews p SET tool_incarnation = t.incarnation
    FROM tools t WHERE p.tool = t.name AND p.created_at >= t.created_at;

-- DeleteTool expires the tool's pending previews.
CREATE INDEX previews_tool_pending_idx ON previews (tool) WHERE state = 'PENDING';
