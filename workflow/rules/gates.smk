# Each CUDA engine image's gate (sdbench.imagegate): one small GPU job in the image before any of
# its engine jobs, which read its output. A driver the image cannot run on fails the gate in one
# line; the image's engine jobs then never start, and every other image's jobs run on.


rule image_gate:
    output:
        P.IMAGE_GATE,
    log:
        "logs/image_gate/{image}.log",
    priority: FIRST
    retries: 0
    container:
        lambda w: PLAN.image_container(w.image)
    resources:
        nodes=1,
        gpu=1,
        mem_mb=4000,
        runtime=10,
    params:
        code=code_digest("sdbench.imagegate"),
        # A rebuilt image is gated again (what it needs of the driver may have changed).
        image=lambda w: image_identity(
            PLAN.image_container(w.image), Path(workflow.basedir) / "containers"
        ),
        rehearsal="--rehearsal" if PLAN.rehearsal else "",
    shell:
        "sdbench image-gate --image {wildcards.image} {params.rehearsal} --output {output} > {log} 2>&1"
