"""JupyterHub for a class: every learner gets their own server from the course image, CPU or GPU.

One server (DockerSpawner, default) or a cluster (KubeSpawner): LABKERNELS_SPAWNER=docker|kubernetes.
Images (build them with instructors/Dockerfile, see instructors/README.md):
  LABKERNELS_CPU_IMAGE (default labkernels:cpu), LABKERNELS_GPU_IMAGE (default labkernels:gpu).
Learners pick a profile when their server starts: "CPU lane" (the Triton interpreter; every chapter runs)
or "GPU lane" (one GPU each: the real timings).
Authentication is left to the instructor (`c.JupyterHub.authenticator_class`): see the README.
"""

import os

c = get_config()  # noqa: F821  (JupyterHub provides get_config when it loads this file)

SPAWNER = os.environ.get("LABKERNELS_SPAWNER", "docker")
CPU_IMAGE = os.environ.get("LABKERNELS_CPU_IMAGE", "labkernels:cpu")
GPU_IMAGE = os.environ.get("LABKERNELS_GPU_IMAGE", "labkernels:gpu")
COURSE_DIR = "/home/jovyan/course"
# The course's own JupyterLab defaults: open on the rendered README (settings come from the image); the file
# browser hides the install's metadata (labkernels.egg-info) besides JupyterLab's defaults.
HIDE_GLOBS = '["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "*.egg-info"]'
SINGLEUSER_ARGS = [
    "--ServerApp.root_dir=" + COURSE_DIR,
    "--LabApp.news_url=None",
    "--ContentsManager.hide_globs=" + HIDE_GLOBS,
]

c.JupyterHub.bind_url = os.environ.get("LABKERNELS_HUB_URL", "http://0.0.0.0:8000")
c.Spawner.default_url = "/lab/tree/README.md"
c.Spawner.args = SINGLEUSER_ARGS
c.Spawner.notebook_dir = COURSE_DIR
c.Spawner.environment = {"TORCH_EXTENSIONS_DIR": "/home/jovyan/.torch_extensions"}
# A CPU-lane server uses up to 2 cores and 8 GiB (the course's CI machine has 2 cores); a GPU server more.
c.Spawner.cpu_limit = 2
c.Spawner.mem_limit = "8G"
c.Spawner.start_timeout = 300  # the first pull of a multi-GB image is slow
c.Spawner.http_timeout = 120

if SPAWNER == "docker":
    # One server: Docker on the hub's machine. GPUs need the NVIDIA container toolkit.
    c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
    c.JupyterHub.hub_ip = "0.0.0.0"  # the learners' containers reach the hub over the Docker network
    c.DockerSpawner.network_name = os.environ.get("LABKERNELS_DOCKER_NETWORK", "labkernels")
    c.DockerSpawner.remove = True  # containers go, the learners' work stays in their volume
    # Each learner's copy of the course (their notebooks and answers) lives in a named volume. Docker fills a
    # new, empty named volume with what the image holds at its mount point: the course and the package.
    c.DockerSpawner.volumes = {"labkernels-{username}": COURSE_DIR}
    c.DockerSpawner.allowed_images = {"CPU lane": CPU_IMAGE, "GPU lane (one GPU)": GPU_IMAGE}

    def give_gpu(spawner):
        """The GPU image gets one GPU (docker run --gpus 1); the CPU image none."""
        if spawner.image == GPU_IMAGE:
            spawner.extra_host_config = {
                "device_requests": [{"Driver": "nvidia", "Count": 1, "Capabilities": [["gpu"]]}]
            }
            spawner.mem_limit = "32G"
            spawner.cpu_limit = 8
        else:
            spawner.extra_host_config = {}

    c.Spawner.pre_spawn_hook = give_gpu

elif SPAWNER == "kubernetes":
    # Many servers: one pod per learner; GPU pods are scheduled on nodes with the NVIDIA device plugin.
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    c.KubeSpawner.image = CPU_IMAGE
    c.KubeSpawner.storage_pvc_ensure = True
    c.KubeSpawner.storage_capacity = "10Gi"
    c.KubeSpawner.pvc_name_template = "labkernels-{username}"
    c.KubeSpawner.volumes = [
        {"name": "course", "persistentVolumeClaim": {"claimName": "labkernels-{username}"}}
    ]
    c.KubeSpawner.volume_mounts = [{"name": "course", "mountPath": COURSE_DIR}]
    # The image's user (NB_UID in the Dockerfile) owns the volume's files.
    c.KubeSpawner.uid = 1000
    c.KubeSpawner.fs_gid = 1000

    def course_copy(image):
        """Unlike Docker, Kubernetes mounts a new claim empty over the course folder, hiding the course and
        the package the image installed there. This init container, from the same image, first copies the
        course into the learner's volume; -n keeps every file already there (the learner's answers)."""
        return [
            {
                "name": "course-copy",
                "image": image,
                "command": ["sh", "-c", f"cp -a -n {COURSE_DIR}/. /mnt/course/"],
                "volumeMounts": [{"name": "course", "mountPath": "/mnt/course"}],
                "securityContext": {"runAsUser": 1000},
            }
        ]

    c.KubeSpawner.init_containers = course_copy(CPU_IMAGE)
    c.KubeSpawner.profile_list = [
        {
            "display_name": "CPU lane",
            "description": "2 cores, 8 GiB: every chapter runs, Triton under its interpreter.",
            "default": True,
            "kubespawner_override": {
                "image": CPU_IMAGE,
                "init_containers": course_copy(CPU_IMAGE),
                "cpu_limit": 2,
                "mem_limit": "8G",
            },
        },
        {
            "display_name": "GPU lane (one GPU)",
            "description": "One NVIDIA GPU, 8 cores, 32 GiB: real timings.",
            "kubespawner_override": {
                "image": GPU_IMAGE,
                "init_containers": course_copy(GPU_IMAGE),
                "cpu_limit": 8,
                "mem_limit": "32G",
                "extra_resource_limits": {"nvidia.com/gpu": "1"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
    ]
else:
    raise ValueError(f"LABKERNELS_SPAWNER must be docker or kubernetes, not {SPAWNER!r}")

# Idle servers go after an hour, so GPUs return to the pool.
c.JupyterHub.services = [
    {"name": "idle-culler", "command": ["python3", "-m", "jupyterhub_idle_culler", "--timeout=3600"]}
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]
