"""How the daemons use Twisted's event loop: the reactor type modules take, the process ``twistd`` tunes (lean poll, garbage collector), writes sent from the write itself and once per turn."""
